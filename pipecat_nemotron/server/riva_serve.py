"""Riva's TTS protos through Ray Serve's gRPC proxy: the servicer function the proxy registers, and pickling.

Serve's proxy hands each request message to a replica pickled (a unary request inside Serve's request object, each
message of a streaming call as the result of an actor call). ``nvidia-riva-client``'s generated classes name the
module their ``.proto`` file was compiled to (``riva.proto.riva_tts_pb2``), while its wheel installs them as
``riva.client.proto.riva_tts_pb2``, so pickle cannot find them by name ("import of module
'riva.proto.riva_tts_pb2' failed") and cloudpickle cannot copy them by value. Importing this module registers a
``copyreg`` reducer for the messages of ``RivaSpeechSynthesis`` (their wire bytes, parsed back by
:func:`parse_message`) in that process: Serve's proxy imports it as the module of :func:`add_servicer_to_server`
(the servicer function it is configured with), and a replica imports :func:`parse_message` by name to unpickle.
"""

from __future__ import annotations

import copyreg
from typing import Any

import riva.client.proto.riva_tts_pb2 as rtts
import riva.client.proto.riva_tts_pb2_grpc as rtts_grpc

__all__ = ["RIVA_TTS_SERVICER", "add_servicer_to_server", "parse_message"]

#: Serve's ``gRPCOptions.grpc_servicer_functions`` entry for ``RivaSpeechSynthesis``.
RIVA_TTS_SERVICER = "pipecat_nemotron.server.riva_serve.add_servicer_to_server"

_MESSAGES: dict[str, Any] = {
    cls.DESCRIPTOR.full_name: cls
    for cls in (
        rtts.SynthesizeSpeechRequest,
        rtts.SynthesizeSpeechResponse,
        rtts.RivaSynthesisConfigRequest,
        rtts.RivaSynthesisConfigResponse,
    )
}


def parse_message(name: str, data: bytes) -> Any:
    """The Riva TTS message of type ``name`` (its proto full name) from its wire bytes."""
    return _MESSAGES[name].FromString(data)


def _reduce(message: Any) -> tuple[Any, tuple[str, bytes]]:
    return parse_message, (message.DESCRIPTOR.full_name, message.SerializeToString())


for _cls in _MESSAGES.values():
    copyreg.pickle(_cls, _reduce)


def add_servicer_to_server(servicer: Any, server: Any) -> None:
    """Register ``RivaSpeechSynthesis`` on Serve's gRPC proxy (Riva's own function, reached through this module)."""
    rtts_grpc.add_RivaSpeechSynthesisServicer_to_server(servicer, server)
