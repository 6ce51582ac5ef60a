"""NServiceBus's header names, as it spells them, and the intents it knows."""

from __future__ import annotations

__all__ = ["H", "INTENTS", "RESERVED"]


class H:
    """Header names, as NServiceBus spells them."""

    MESSAGE_ID = "NServiceBus.MessageId"
    CORRELATION_ID = "NServiceBus.CorrelationId"
    CONVERSATION_ID = "NServiceBus.ConversationId"
    ENCLOSED_MESSAGE_TYPES = "NServiceBus.EnclosedMessageTypes"
    CONTENT_TYPE = "NServiceBus.ContentType"
    MESSAGE_INTENT = "NServiceBus.MessageIntent"
    REPLY_TO_ADDRESS = "NServiceBus.ReplyToAddress"
    TIME_SENT = "NServiceBus.TimeSent"
    ORIGINATING_ENDPOINT = "NServiceBus.OriginatingEndpoint"
    ORIGINATING_MACHINE = "NServiceBus.OriginatingMachine"
    RELATED_TO = "NServiceBus.RelatedTo"
    VERSION = "NServiceBus.Version"
    FORWARD_DESTINATION = "NServiceBus.SqlServer.ForwardDestination"
    FAILED_Q = "NServiceBus.FailedQ"
    TIME_OF_FAILURE = "NServiceBus.TimeOfFailure"
    CONTROL_MESSAGE = "NServiceBus.ControlMessage"
    DELIVER_AT = "NServiceBus.DeliverAt"
    PROCESSING_STARTED = "NServiceBus.ProcessingStarted"
    PROCESSING_ENDED = "NServiceBus.ProcessingEnded"
    PROCESSING_ENDPOINT = "NServiceBus.ProcessingEndpoint"
    PROCESSING_MACHINE = "NServiceBus.ProcessingMachine"
    HOST_ID = "$.diagnostics.hostid"
    HOST_DISPLAY_NAME = "$.diagnostics.hostdisplayname"
    ORIGINATING_HOST_ID = "$.diagnostics.originating.hostid"
    RETRIES = "NServiceBus.Retries"  # delayed retries performed (Headers.DelayedRetries)
    RETRIES_TIMESTAMP = "NServiceBus.Retries.Timestamp"
    FL_RETRIES = "NServiceBus.FLRetries"  # immediate retries (Headers.ImmediateRetries)
    EXCEPTION_TYPE = "NServiceBus.ExceptionInfo.ExceptionType"
    EXCEPTION_MESSAGE = "NServiceBus.ExceptionInfo.Message"
    EXCEPTION_SOURCE = "NServiceBus.ExceptionInfo.Source"
    EXCEPTION_STACK_TRACE = "NServiceBus.ExceptionInfo.StackTrace"
    # ServiceControl's retries (NServiceBus.Core ServicePlatform/Retries)
    RETRY_UNIQUE_MESSAGE_ID = "ServiceControl.Retry.UniqueMessageId"
    RETRY_ACK_QUEUE = "ServiceControl.Retry.AcknowledgementQueue"
    RETRY_SUCCESSFUL = "ServiceControl.Retry.Successful"
    RETRY_ACK_SENT = "ServiceControl.Retry.AcknowledgementSent"


#: intent column values -> the NServiceBus.MessageIntent header
INTENTS = {"send": "Send", "publish": "Publish", "reply": "Reply"}

#: headers a sender must never set: the transport and NServiceBus own them
RESERVED = (H.FORWARD_DESTINATION, H.CONTROL_MESSAGE)
