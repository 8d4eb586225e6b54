"""The weights' user error, apart from the format's reader so that the pre-flight can catch
it without loading numpy."""


class ConvertError(ValueError):
    """Bad conversion input; the message names the file and the tensor."""
