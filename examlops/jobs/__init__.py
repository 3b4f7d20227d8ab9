"""Offline jobs (seed 001): a task answered for many instances under a long budget, in the gaps around
interactive calls. See README.md."""

from examlops.jobs.model import Instance, Job, JobState, parse_duration_ms
from examlops.jobs.ports import BackgroundInference, JobStore

__all__ = ["BackgroundInference", "Instance", "Job", "JobState", "JobStore", "parse_duration_ms"]
