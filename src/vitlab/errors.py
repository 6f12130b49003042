"""vitlab's own error types: each carries a message that says what is wrong and what to do."""


class VitlabError(Exception):
    """Base of every error vitlab raises on purpose; the CLI prints its message without a traceback."""

    exit_code = 1


class UsageError(VitlabError):
    """The user asked for something that cannot work (a bad option or value); the CLI exits with code 2."""

    exit_code = 2


class ConfigError(UsageError):
    """A model or training config that is invalid or does not fit together."""


class CheckpointError(VitlabError):
    """A checkpoint that cannot be read, is of an unknown kind, or does not fit the model."""


class MissingPathError(UsageError, CheckpointError):
    """A checkpoint, run folder or name that does not exist: a bad path, so exit code 2 like every bad argument,
    and still a CheckpointError for code that catches those."""


class DataError(UsageError):
    """A data set that is missing, empty, corrupt or does not fit the model; exits with code 2."""
