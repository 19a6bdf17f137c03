"""The errors of ``common.features``: every one names the file, the record and the fix."""


class RegionFeatureError(ValueError):
    """A region-feature file (or an input file being converted) is missing, corrupt, incomplete or malformed."""


class MissingImageError(RegionFeatureError, KeyError):
    """The store has no features for the requested image id."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0])
