"""SpeedAdvisor: the speed-up guides' checklist, checked against the running fit."""

from lightning_speedpack.advisor.callback import SpeedAdvisor
from lightning_speedpack.advisor.rules import AdvisorFinding, DeviceInfo

__all__ = ["AdvisorFinding", "DeviceInfo", "SpeedAdvisor"]
