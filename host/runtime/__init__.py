"""The runtime: drives a device holding a compiled appliance image (prompt runs, then one run per token)."""
from ringgpt.host.runtime.appliance import Appliance, ApplianceError, ApplianceResult
from ringgpt.host.runtime.generation import (LOGITS_BOUND, GenerationReport, ReferenceCheck,
                                             check_against_reference, relative_rms, run_generation)
from ringgpt.host.runtime.images import cache_root, cached_image

__all__ = ["LOGITS_BOUND", "Appliance", "ApplianceError", "ApplianceResult", "GenerationReport", "ReferenceCheck",
           "cache_root", "cached_image", "check_against_reference", "relative_rms", "run_generation"]
