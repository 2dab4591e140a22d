"""Imports every domain's models so Base.metadata is complete (Alembic, tests)."""

from app.audit.models import AuditEvent
from app.auth.models import ApiToken, User
from app.batches.models import BatchFiring, BatchSchedule
from app.cycle.models import SchedulerLease
from app.db import Base
from app.installation.models import Installation
from app.jobs.models import Job, JobEvent
from app.nodes.models import Allocation, ClusterSecret, Gpu, GpuSample, Node
from app.notifications.models import Notification
from app.projects.models import Project, ProjectMember
from app.windows.models import Window

__all__ = [
    "Allocation",
    "ApiToken",
    "AuditEvent",
    "Base",
    "BatchFiring",
    "BatchSchedule",
    "ClusterSecret",
    "Gpu",
    "GpuSample",
    "Installation",
    "Job",
    "JobEvent",
    "Node",
    "Notification",
    "Project",
    "ProjectMember",
    "SchedulerLease",
    "User",
    "Window",
]
