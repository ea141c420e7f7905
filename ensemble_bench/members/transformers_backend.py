"""The default backend: transformers steps the member's model in this process (members/local.py, an
encoder-decoder members/seq2seq.py). Its settings are the member's own fields (dtype, device, device_map,
max_memory, quantization, kind); it takes no section of its own, and its rows' keys name no backend."""

from ensemble_bench.members.backends import DEFAULT, Backend, register_backend

register_backend(Backend(name=DEFAULT, loader="ensemble_bench.members.loading:load_on_transformers"))
