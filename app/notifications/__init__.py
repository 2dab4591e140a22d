"""Job notifications, as sbatch --mail-type, by webhook: a job that asks for them (its
`notify_url`, `notify_on`) has a message POSTed when it starts, ends or fails.

``models``: the outbox, one row per message, written in the transaction of the state
change it reports (so none is lost, whatever fails after); ``outbox``: what a change
queues (:func:`outbox.queue_for`, called by the one function that changes a job's
state); ``sender``: :func:`sender.send_due`, run by the scheduler's beat, which retries
with backoff and notes in the job's history a message it had to give up on; ``hosts``:
which hosts the server may POST to.
"""
