"""Exceptions and warnings shared by the runtime, kept apart so any module can import them."""


class TunekitWarning(UserWarning):
    """Something went wrong that tunekit recovered from (a bad results file, a failed tuning)."""


class SettingsError(ValueError):
    """A setting has a value tunekit cannot use; the message is one line naming the setting (for an
    environment variable, the variable and its value), so the ``tunekit`` command can print it as is."""


class ResultsStoreError(RuntimeError):
    """Results cannot be saved where they were asked to go: the file is read-only, or unusable and
    replaced by memory. Raised by explicit writes (import, offline tuning) instead of losing them."""


class ResultsImportError(ValueError):
    """A results file could not be imported; ``errors`` lists every bad row as (row number, reason)."""

    def __init__(self, path, errors):
        self.path = str(path)
        self.errors = list(errors)
        lines = "\n".join(f"  row {row}: {reason}" for row, reason in self.errors[:20])
        more = f"\n  ... and {len(self.errors) - 20} more" if len(self.errors) > 20 else ""
        super().__init__(f"{self.path}: {len(self.errors)} invalid row(s), nothing imported:\n{lines}{more}")
