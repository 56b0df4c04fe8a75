"""All configuration, parsed and validated once at start-up into one frozen object.

Every default lives in this package: the Settings fields' own (schema.py) and the constants
no variable sets (defaults.py); the native engine gets each of its values from here (its own
C++ defaults serve direct callers such as tests). env.py reads the environment; a bad value
stops start-up with a message that names the variable. repack.py resolves SEMIF_REPACK on the
machine it runs on.
"""

from semif_proxy.settings.defaults import (
    AUTO_CTX_MAX,
    CPU_DRAIN_GRACE_S,
    DEFAULT_MAX_BODY_BYTES,
    FALLBACK_CTX,
    JSON_LINES_PER_JOB,
    LLAMA_BACKOFF_INITIAL_S,
    LLAMA_BACKOFF_MAX_S,
    LLAMA_UNHEALTHY_AFTER,
    MIN_CTX,
    UBATCH_CPU,
    UBATCH_GPU,
)
from semif_proxy.settings.env import load_settings
from semif_proxy.settings.repack import AMX_FLAGS, RepackChoice, repack_choice
from semif_proxy.settings.schema import Settings, SettingsError, Temperature, context_for

__all__ = [
    "AMX_FLAGS",
    "AUTO_CTX_MAX",
    "CPU_DRAIN_GRACE_S",
    "DEFAULT_MAX_BODY_BYTES",
    "FALLBACK_CTX",
    "JSON_LINES_PER_JOB",
    "LLAMA_BACKOFF_INITIAL_S",
    "LLAMA_BACKOFF_MAX_S",
    "LLAMA_UNHEALTHY_AFTER",
    "MIN_CTX",
    "UBATCH_CPU",
    "UBATCH_GPU",
    "RepackChoice",
    "Settings",
    "SettingsError",
    "Temperature",
    "context_for",
    "load_settings",
    "repack_choice",
]
