"""Exit codes of every kvforensics command (README, "Exit codes")."""

EXIT_OK = 0  # ran; no finding at or above --fail-on
EXIT_FINDINGS = 1  # at least one finding at or above --fail-on (default: warning)
EXIT_USAGE = 2  # bad arguments, or input that cannot be read or holds no startup
EXIT_COLLECTION_FAILED = 3  # nothing could be collected from a target
EXIT_INTERNAL = 4  # a bug: unexpected exception (KVFORENSICS_DEBUG=1 shows the traceback)
EXIT_INTERRUPTED = 130  # Ctrl-C
