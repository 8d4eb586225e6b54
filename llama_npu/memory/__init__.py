"""Memory: measurement now; the planner lives beside it."""
