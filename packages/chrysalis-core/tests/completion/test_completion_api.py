"""The public surface of ``chrysalis.core.completion``: exactly the documented names, and an
import that loads neither asyncio nor trio."""

from __future__ import annotations

import subprocess
import sys

import chrysalis.core.completion as completion

EXPECTED = {
    "EVENT_CREDIT_CAPACITY",
    "NOOP_NOTIFIER",
    "AbortStarted",
    "AuthenticationFailed",
    "BlockReason",
    "BudgetStatistics",
    "BufferCapacityError",
    "ByteBudget",
    "ByteReservation",
    "BytesLike",
    "CancelRequest",
    "CloseQueued",
    "CommandCompletion",
    "CommandError",
    "CommandFailed",
    "CommandReceipt",
    "CommandResult",
    "CommandSender",
    "CommandSubmission",
    "Completion",
    "CompletionCredits",
    "CompletionModelError",
    "CompletionQueueClosed",
    "CompletionQueueFull",
    "CompletionReceiver",
    "CompletionSender",
    "ConnectionClosed",
    "ConnectionCreated",
    "ConnectionEstablished",
    "ConnectionRef",
    "ConnectionRefAllocator",
    "ControlOutcome",
    "CreditPermit",
    "CreditStatistics",
    "DiscardCompletion",
    "DiscardSubmission",
    "DriverId",
    "DriverIdAllocator",
    "DriverStopped",
    "EndpointChannels",
    "EndpointSubmission",
    "EndpointSubmissionQueue",
    "ExceedsBudget",
    "FinishCompletion",
    "FinishSubmission",
    "IdExhausted",
    "IncomingStream",
    "InvalidReceiveBuffer",
    "LeasedCompletion",
    "NoopNotifier",
    "Notifier",
    "OperationCancellation",
    "OperationId",
    "PostedBuffer",
    "QueueClosed",
    "QueueEmpty",
    "QueueExhausted",
    "QueueFull",
    "QueueReceiver",
    "QueueSender",
    "QueueStatistics",
    "ReceiveCompletion",
    "ReceiveOptions",
    "ReceiveStatus",
    "ReceiveSubmission",
    "RequestId",
    "ResetCompletion",
    "ResetSubmission",
    "RetainedBytes",
    "SendCompletion",
    "SendOutcome",
    "SendSubmission",
    "ShutdownStarted",
    "StopCompletion",
    "StopSubmission",
    "StreamClosed",
    "StreamOpened",
    "StreamRef",
    "StreamSubmission",
    "StreamSubmitter",
    "SubmissionClosed",
    "SubmissionLimits",
    "SubmissionReceipt",
    "SubmissionReceiver",
    "SubmissionRejected",
    "SubmissionStatistics",
    "TooManyWaiters",
    "TryCompleteError",
    "Wakeup",
    "WakeupStatistics",
    "WouldBlock",
    "bounded_queue",
    "completion_queue",
    "next_driver_id",
}


def test_all_lists_exactly_the_public_api() -> None:
    assert set(completion.__all__) == EXPECTED
    assert len(completion.__all__) == len(EXPECTED)
    for name in completion.__all__:
        assert hasattr(completion, name), name


def test_public_classes_and_functions_are_documented() -> None:
    for name in completion.__all__:
        value = getattr(completion, name)
        ours = getattr(value, "__module__", "").startswith("chrysalis.core.completion")
        if (isinstance(value, type) or callable(value)) and ours:
            assert value.__doc__, name


def test_every_exception_derives_from_the_package_base() -> None:
    for name in completion.__all__:
        value = getattr(completion, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            assert issubclass(value, completion.CompletionModelError), name


def test_import_loads_neither_asyncio_nor_trio() -> None:
    code = (
        "import sys\n"
        "import chrysalis.core.completion\n"
        "print('asyncio' in sys.modules, 'trio' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    assert result.stdout.split() == ["False", "False"]


def test_completion_is_a_regular_subpackage_of_the_namespace() -> None:
    import chrysalis

    assert getattr(chrysalis, "__file__", None) is None
    assert completion.__file__ is not None
