"""Pieces of the distributed weight sync that need no process group: the byte layout of a bucket
(what SGLang 0.5.23's receiving FlattenedTensorBucket.empty allocates from the metadata) and the
config settings."""

from __future__ import annotations

import pytest
import torch

from harness.fake_sglang import FlattenedTensorBucket
from vepo_mcore.config import JobConfig
from vepo_mcore.rollout.weight_sync import bucket_metadata, flatten_bucket


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_flattened_bucket_is_what_the_engine_allocates_from_its_metadata(dtype):
    named = [
        ("a", torch.randn(3, 4).to(dtype)),
        ("b", torch.randn(5).to(dtype)),
        ("c", torch.randn(2, 1, 3).to(dtype)),
    ]
    names, dtypes, shapes = bucket_metadata(named)
    assert dtypes == [str(dtype).removeprefix("torch.")] * 3 and shapes == [[3, 4], [5], [2, 1, 3]]
    sent = flatten_bucket(named)
    receive = FlattenedTensorBucket.empty(names, dtypes, shapes, "cpu")
    assert sent.dtype == torch.uint8 and receive.get_flattened_tensor().shape == sent.shape
    receive.get_flattened_tensor().copy_(sent)  # what the broadcast does
    for (n1, t1), (n2, t2) in zip(named, receive.reconstruct_tensors()):
        assert n1 == n2 and t2.dtype == dtype and torch.equal(t1, t2)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("weight_sync", "nccl", "rl.rollout.weight_sync must be 'colocated' or 'distributed'"),
        ("weight_sync_backend", "mpi", "rl.rollout.weight_sync_backend must be 'nccl' or 'gloo'"),
    ],
)
def test_weight_sync_settings_are_checked_naming_the_field(field, value, message):
    cfg = JobConfig()
    setattr(cfg.rl.rollout, field, value)
    with pytest.raises(ValueError, match=message):
        cfg.rl.validate()


def test_update_group_address_is_the_interface_that_reaches_the_master(monkeypatch):
    """The TCP store of an update group is hosted at the address of the interface routing to
    MASTER_ADDR, never the host name's /etc/hosts entry (often 127.0.1.1, unreachable from other
    nodes)."""
    import ipaddress

    from vepo_mcore.rollout.weight_sync import _host_address

    monkeypatch.setattr("socket.gethostname", lambda: "node7")
    monkeypatch.setattr("socket.gethostbyname", lambda host: {"node7": "127.0.1.1"}.get(host, host))
    assert _host_address("127.0.0.1") == "127.0.0.1"  # one node
    monkeypatch.setenv("MASTER_ADDR", "192.0.2.10")  # TEST-NET-1: routed, never contacted
    try:
        address = _host_address()
    except ValueError as exc:  # a machine with no route at all says so, naming MASTER_ADDR
        assert "MASTER_ADDR" in str(exc)
    else:
        assert address != "127.0.1.1" and not ipaddress.ip_address(address).is_loopback
    monkeypatch.delenv("MASTER_ADDR")
    assert _host_address() == "127.0.0.1"
