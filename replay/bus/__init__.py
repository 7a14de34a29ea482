"""The replay job bus: port, in-process adapter (embedded default) and Kafka adapter.

``replay.bus.kafka`` imports aiokafka; import it only where Kafka is used.
"""

from replay.bus.memory import InProcessJobBus
from replay.bus.port import (
    RESULTS_TOPIC,
    JobBus,
    JobBusFull,
    JobBusUnavailable,
    JobConsumer,
    JobDelivery,
    MalformedMessage,
    ResultStream,
    jobs_topic,
    worker_group,
)

__all__ = [
    "RESULTS_TOPIC",
    "InProcessJobBus",
    "JobBus",
    "JobBusFull",
    "JobBusUnavailable",
    "JobConsumer",
    "JobDelivery",
    "MalformedMessage",
    "ResultStream",
    "jobs_topic",
    "worker_group",
]
