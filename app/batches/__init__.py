"""Cron-triggered batches: schedules that submit a set of jobs at local wall-clock times.

``models``: the schedule and its firings (one row per fire time, UNIQUE per schedule, which
is what makes a firing exactly-once); ``schemas``: REST bodies; ``service``: cron arithmetic,
CRUD and :func:`service.fire_due`, which Celery beat calls every few seconds.
"""
