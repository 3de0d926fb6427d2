"""The codec configurations the benchmarks compare, as EPipeStrategy keyword arguments."""

from __future__ import annotations

#: label -> EPipeStrategy(**kwargs) codec arguments
CODECS = {
    "none": {"compressor": "none"},
    "sortquant-8": {"compressor": "sortquant", "bits": 8},
    "quantize-8": {"compressor": "quantize", "bits": 8},
    "fp16": {"compressor": "fp16"},
    "topk-0.1": {"compressor": "topk", "compressor_kwargs": {"fraction": 0.1}},
    "powersgd-4": {"compressor": "powersgd", "compressor_kwargs": {"rank": 4}},
    # chosen per link from the rate of its own traffic (once it has carried 2 MiB) and the codecs' measured speed
    "auto": {"compressor": "auto", "compressor_kwargs": {"retune_every": 1000}},
}

#: more codecs, run where a script is asked for them by name (``slow_link.py --methods``)
NAMED = {
    "lloydmax-4": {"compressor": "lloydmax", "bits": 4},
    "hadamard-4": {"compressor": "hadamard", "bits": 4},
}

#: codecs that learn with the model, run where a script is asked for them by name: the
#: bottleneck is sized and PCA-started on the module's ``example_input_array`` (``worker.py``
#: gives it the first micro-batch of the run's data)
LEARNED = {
    "bottleneck-0.1": {"compressor": "bottleneck", "compressor_kwargs": {"ratio": 0.1}},
}
