"""Stand-ins the tests and the benchmarks share, kept out of the package (nothing in vepo_mcore or
recipes imports them): fake_sglang, the CPU fake of sglang.Engine that registers the 'fake_sglang'
rollout engine when imported; faults, the kill -9 / damaged-checkpoint / second-writer harness."""
