"""The one choice of a miner's decoding engine (``raycl.models.engines.choose_engine``) where no model is read:
GPU miners with ``auto`` choose on their own device, and what the driver says of each choice. The choices that
read a model are in test_engine_fallback.py and test_ct2_engine.py."""

from __future__ import annotations

import pytest

from raycl.errors import UserError
from raycl.models.engines import choose_engine


def test_gpu_miners_choose_auto_on_their_own_device_and_the_driver_says_so() -> None:
    got = choose_engine("auto", "no/such/model", device="cpu", precision="bf16", gpus_per_miner=0.5)
    assert got.deferred and got.engine == "auto"
    assert got.line("bf16") == (
        "mining.engine=auto: each GPU miner decodes with CTranslate2 if it converts the "
        "model and runs bf16 there, else with HF"
    )
    configured = choose_engine("hf", "no/such/model", device="cpu", precision="fp32", gpus_per_miner=0.5)
    assert (configured.engine, configured.why, configured.line("fp32")) == ("hf", "as configured", None)
    with pytest.raises(UserError) as err:
        choose_engine("fast", "no/such/model", device="cpu", precision="fp32", gpus_per_miner=0.5)
    assert str(err.value) == "mining.engine: expected one of auto | hf | ctranslate2, got 'fast'"
    with pytest.raises(UserError, match="^mining.precision: int8 exists only with"):  # CPU miners: chosen here
        choose_engine("hf", "no/such/model", device="cpu", precision="int8")
