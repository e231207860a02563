"""The one exception type of the media pipeline."""


class MediaError(ValueError):
    """Bad media input or a violated limit; the message names the problem (the HTTP layer maps it to a 4xx)."""
