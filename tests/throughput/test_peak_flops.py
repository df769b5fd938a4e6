from __future__ import annotations

import pytest

from lightning_speedpack.throughput.peak_flops import (
    PEAK_FLOPS,
    chip_of,
    dtype_of_precision,
    peak_flops,
)

T = 1e12


@pytest.mark.parametrize(
    ("name", "chip"),
    [
        ("Tesla V100-SXM2-16GB", "v100 sxm"),
        ("Tesla V100-PCIE-32GB", "v100 pcie"),
        ("Tesla V100S-PCIE-32GB", "v100s"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA GeForce RTX 4090", "rtx 4090"),
        ("NVIDIA H100 80GB HBM3", "h100 sxm"),
        ("NVIDIA H100 PCIe", "h100 pcie"),
        ("NVIDIA H100 NVL", "h100 nvl"),
        ("NVIDIA H200", "h200 sxm"),
        ("NVIDIA H200 NVL", "h200 nvl"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GeForce RTX 3050", None),
        ("cpu", None),
    ],
)
def test_device_names_map_to_chips(name: str, chip: str | None) -> None:
    assert chip_of(name) == chip


def test_l40s_is_not_an_l4() -> None:
    assert chip_of("NVIDIA L40S") == "l40s"
    assert peak_flops("NVIDIA L40S", "bf16-mixed") == pytest.approx(362.05 * T)
    assert peak_flops("NVIDIA L4", "bf16-mixed") == pytest.approx(121 * T)


def test_every_required_chip_has_every_precision() -> None:
    for chip in (
        "a100",
        "a10g",
        "l4",
        "l40s",
        "rtx 4090",
        "h100 sxm",
        "h100 pcie",
        "h100 nvl",
        "h200 sxm",
        "b200",
    ):
        assert set(PEAK_FLOPS[chip]) == {"fp32", "tf32", "bf16", "fp16"}, chip
    assert set(PEAK_FLOPS["v100 sxm"]) == {"fp32", "fp16"}  # no TF32/BF16 tensor cores


def test_figures_are_dense_not_sparse() -> None:
    # Datasheets print 1,979 TFLOPS bf16 "with sparsity" for the H100 SXM; dense is half.
    assert peak_flops("NVIDIA H100 80GB HBM3", "bf16-mixed") == pytest.approx(989.4 * T)
    assert peak_flops("NVIDIA H200", "16-mixed") == pytest.approx(989.4 * T)
    assert peak_flops("NVIDIA B200", "bf16-true") == pytest.approx(2250 * T)
    assert peak_flops("NVIDIA A100-SXM4-40GB", "32-true") == pytest.approx(19.5 * T)


@pytest.mark.parametrize(
    ("precision", "matmul", "dtype"),
    [
        ("bf16-mixed", "highest", "bf16"),
        ("bf16-true", "highest", "bf16"),
        ("16-mixed", "highest", "fp16"),
        ("16-true", "high", "fp16"),
        ("32-true", "highest", "fp32"),
        ("32-true", "high", "tf32"),
        ("32-true", "medium", "tf32"),
        (32, "highest", "fp32"),
    ],
)
def test_precision_to_dtype(precision: str, matmul: str, dtype: str) -> None:
    assert dtype_of_precision(precision, matmul) == dtype


def test_unknown_precision() -> None:
    with pytest.raises(ValueError, match="no peak FLOPs for precision '64-true'"):
        dtype_of_precision("64-true")
    assert peak_flops("NVIDIA A100-SXM4-40GB", "64-true") is None


def test_tf32_falls_back_to_fp32_on_v100() -> None:
    assert peak_flops("Tesla V100-SXM2-16GB", "32-true", "high") == pytest.approx(15.7 * T)
    assert peak_flops("Tesla V100-SXM2-16GB", "bf16-mixed") is None
    assert peak_flops("NVIDIA A100-SXM4-40GB", "32-true", "high") == pytest.approx(156 * T)
