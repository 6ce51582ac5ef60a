"""The Particular platform: what an NServiceBus endpoint does after (or instead of) processing a
message, so ServiceControl, ServiceInsight and ServicePulse see a Spark endpoint like any other.
Dialect-free.

- `after`: the acknowledgement's extra work, in its transaction (audit copies, ``forwardTo``
  copies, ServiceControl retry acknowledgements), and what it hands to monitoring.
- `monitoring`: ServicePulse's monitoring reports (best-effort, outside any transaction).
- The sink's ``fail()`` and ``retry_later()`` rows are built by `transport.sending.builder` with
  `wire.failure_headers`, the one builder of failure headers.
"""
