"""The workers' side of FLA's lanes (parity.execute.backends.fla_lane): send a case to a lane and
read its answer. The lanes' addresses and authkey reach the workers through the environment."""

from __future__ import annotations

import os
import threading
import time
import zlib
from multiprocessing.connection import Client

from parity.model.spec import Unsupported

LANES_ENV = "PARITY_FLA_LANES"  # the lanes' addresses, ";"-separated
FALLBACK_ENV = "PARITY_FLA_FALLBACK"  # the interpreter lane's address, for cases CUDA refuses
KEY_ENV = "PARITY_FLA_LANE_KEY"  # the authkey, hex
CONNECT_S = 120.0  # how long a worker waits for a lane to listen (a GPU lane imports torch first)


class LaneError(RuntimeError):
    """FLA raised in the lane (message: its type, text and traceback); record_fields: what the error
    record keeps of it (platform, versions, notes: parity.execute.backends.base.execute)."""

    def __init__(self, message: str, record_fields: dict | None = None):
        super().__init__(message)
        self.record_fields = record_fields or {}


# ------------------------------------------------------------------ the worker's side
_connections: dict[str, object] = {}
_lock = threading.Lock()


def lane_addresses() -> list[str]:
    return [a for a in os.environ.get(LANES_ENV, "").split(";") if a]


def fallback_address() -> str | None:
    return os.environ.get(FALLBACK_ENV) or None


def _connect(address: str):
    conn = _connections.get(address)
    if conn is not None:
        return conn
    key = bytes.fromhex(os.environ[KEY_ENV])
    deadline = time.monotonic() + CONNECT_S
    while True:
        try:
            conn = Client(address, family="AF_UNIX", authkey=key)
            break
        except (FileNotFoundError, ConnectionRefusedError):
            if time.monotonic() > deadline:
                raise LaneError(f"no FLA lane listens at {address} after {CONNECT_S:g} s") from None
            time.sleep(0.2)
    _connections[address] = conn
    return conn


def call(address: str, case, inputs: dict):
    """FLA's Execution of `case` from the lane at `address`; the lane's Unsupported or error raised here."""
    with _lock:
        conn = _connect(address)
        try:
            conn.send((case.to_dict(), inputs))
            reply = conn.recv()
        except (EOFError, OSError) as e:
            _connections.pop(address, None)
            raise LaneError(f"the FLA lane at {address} went away ({type(e).__name__}: {e})") from None
    if reply[0] == "ok":
        return reply[1]
    _, kind, message, record_fields = reply
    if kind == "unsupported":
        raise Unsupported(message)
    raise LaneError(message, record_fields)


def pick_lane(case_id: str) -> str:
    """The lane a case goes to: one per case id, spread over the lanes (every worker picks alike)."""
    lanes = lane_addresses()
    return lanes[zlib.crc32(case_id.encode()) % len(lanes)]


def forget_connections() -> None:
    """Drop this process's connections (the lanes they reach are gone)."""
    _connections.clear()
