from app.compiled_core import use_compiled

# Before anything imports app.scheduling: its compiled build, if one matches the source.
use_compiled()
