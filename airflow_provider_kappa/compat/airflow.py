"""The Airflow names the operators and the DAG factory use that Airflow 3.1 keeps outside ``airflow.sdk``.

From Airflow 3.2 (Task SDK 1.2) they are all part of the Task SDK's public interface, ``airflow.sdk``
and ``airflow.sdk.exceptions``, and are taken from there. Airflow 3.1, the lowest release declared
(``make test-compat`` runs it), has the same classes in ``airflow.exceptions``, ``airflow.configuration``,
``airflow.timetables.interval`` and the standard provider. This module is the one place that knows;
everything else imports these names from here.
"""

from __future__ import annotations

try:  # Airflow >= 3.2
    from airflow.sdk.exceptions import (
        AirflowException,
        AirflowFailException,
        AirflowRescheduleException,
        AirflowSkipException,
    )
except ImportError:  # Airflow 3.1
    from airflow.exceptions import (  # type: ignore[no-redef]
        AirflowException,
        AirflowFailException,
        AirflowRescheduleException,
        AirflowSkipException,
    )

try:  # Airflow >= 3.2
    from airflow.sdk import BaseBranchOperator, CronDataIntervalTimetable, DeltaDataIntervalTimetable, conf
except ImportError:  # Airflow 3.1
    from airflow.configuration import conf  # type: ignore[assignment]
    from airflow.providers.standard.operators.branch import BaseBranchOperator  # type: ignore[assignment]
    from airflow.timetables.interval import (  # type: ignore[assignment]
        CronDataIntervalTimetable,
        DeltaDataIntervalTimetable,
    )

__all__ = [
    "AirflowException",
    "AirflowFailException",
    "AirflowRescheduleException",
    "AirflowSkipException",
    "BaseBranchOperator",
    "CronDataIntervalTimetable",
    "DeltaDataIntervalTimetable",
    "conf",
]
