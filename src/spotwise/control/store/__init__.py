"""The job store: jobs, attempts, events, users and tokens in one database behind one interface.

SQLite at ``$SPOTWISE_HOME/spotwise.db`` by default, PostgreSQL for a team
(``SPOTWISE_DB=postgresql://...``); the schema is versioned by Alembic and upgraded at open.
"""

from spotwise.control.store.core import Store
from spotwise.control.store.models import Attempt, Job, JobState, Token, User, spotwise_home

__all__ = ["Attempt", "Job", "JobState", "Store", "Token", "User", "spotwise_home"]
