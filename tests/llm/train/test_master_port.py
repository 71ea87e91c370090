"""Two single-process ``tiltlab llm train`` runs started together get different rendezvous ports (TRL's
colocated vLLM would take 29500 in both: EADDRINUSE); a launcher's or the user's ``MASTER_PORT`` is kept."""

from __future__ import annotations

import os
import socket

from tiltlab.llm.train.cli import free_master_port


def test_an_unset_port_becomes_a_free_one(monkeypatch):
    monkeypatch.delenv("MASTER_PORT", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    free_master_port()

    port = int(os.environ["MASTER_PORT"])
    assert 0 < port < 65536
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))  # free: it binds


def test_a_set_port_or_a_launched_run_is_left_alone(monkeypatch):

    monkeypatch.setenv("MASTER_PORT", "29511")
    free_master_port()
    assert os.environ["MASTER_PORT"] == "29511"
    monkeypatch.delenv("MASTER_PORT")
    monkeypatch.setenv("WORLD_SIZE", "2")  # a launcher sets the port for every rank: do not choose one here
    free_master_port()
    assert "MASTER_PORT" not in os.environ
