"""Memory strategies, one module each, switched on from the recipe's `strategies:` section."""
