# A real mmseg EncoderDecoder (ResNetV1c-18 at quarter width + FCN head) on the small
# synthetic dataset of tools/make_synthetic_dataset.py: the config of `make demo` and of
# the end-to-end tests. 8 cards x 2 images per card.
_base_ = ["../_base_/gcu_runtime.py", "./_base_/fcn_r18-tiny_synthetic-64x64.py"]

default_scope = "mmseg"
vis_backends = [dict(type="LocalVisBackend")]
visualizer = dict(type="SegLocalVisualizer", vis_backends=vis_backends, name="visualizer")
log_processor = dict(by_epoch=False)
log_level = "INFO"
load_from = None
resume = False
randomness = dict(seed=0)
