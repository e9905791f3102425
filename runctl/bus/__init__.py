"""The JetStream bus client shared by the CLI, the SDK and every service."""

from runctl.bus.client import (
    DEFAULT_URL,
    Bus,
    Consumer,
    ConsumerSpec,
    Delivery,
    StreamLimits,
    each_event,
    nats_url,
    stream_configs,
)

__all__ = [
    "DEFAULT_URL",
    "Bus",
    "Consumer",
    "ConsumerSpec",
    "Delivery",
    "StreamLimits",
    "each_event",
    "nats_url",
    "stream_configs",
]
