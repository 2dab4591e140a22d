"""Job notifications, as sbatch --mail-type, by webhook: a job that asks for them (its
`notify_url`, `notify_on`) has a message POSTed when it starts, ends or fails.

This package is what notifications need below the jobs domain: ``models``, the outbox,
one row per message, written in the transaction of the state change it reports (so none
is lost, whatever fails after); ``hosts``, which hosts the server may POST to;
``deliveries``, a job's messages as the API lists them. What a job's change queues
(``app/jobs/outbox.py``, called by the one function that changes a job's state) and the
sender that delivers them (``app/jobs/webhooks.py``, run by the scheduler's beat, which
retries with backoff and notes in the job's history a message it had to give up on) live
with the jobs they read.
"""
