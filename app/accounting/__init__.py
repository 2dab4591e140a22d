"""Per-job efficiency (like Slurm's seff) and per-project usage reports from GPU telemetry.

``efficiency`` is the pure computation; ``service`` loads rows and calls it.  See
docs/efficiency.md.
"""
