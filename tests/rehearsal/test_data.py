"""The synthetic set is read by the config's own dataset class, labels as it expects."""

import numpy as np
import pytest

from mmgcu.rehearsal.data import IGNORE_INDEX, write_dataset


@pytest.mark.parametrize(
    "dataset_type, reduce_zero_label",
    [("ADE20KDataset", True), ("LoveDADataset", True), ("CityscapesDataset", False)],
)
def test_the_dataset_class_reads_it(tmp_path, dataset_type, reduce_zero_label):
    from mmengine.registry import init_default_scope
    from mmseg.registry import DATASETS

    init_default_scope("mmseg")

    cfg = dict(type=dataset_type, data_root=str(tmp_path))
    model = dict(decode_head=dict(num_classes=5, ignore_index=255))
    facts = write_dataset(str(tmp_path), cfg, "train", 3, 32, model)
    assert facts["reduce_zero_label"] is reduce_zero_label and facts["labels"] == 5
    dataset = DATASETS.build(
        dict(
            cfg,
            data_prefix=dict(img_path="img_dir/train", seg_map_path="ann_dir/train"),
            ann_file="train.txt",
            pipeline=[dict(type="LoadImageFromFile"), dict(type="LoadAnnotations")],
        )
    )
    assert len(dataset) == 3
    sample = dataset[0]
    assert sample["img"].shape == (32, 32, 3)
    labels = set(np.unique(sample["gt_seg_map"]).tolist())
    assert IGNORE_INDEX in labels  # the border, also where label 0 is reduced away
    # the labels the model predicts, after the dataset's reduction: none lost, none beyond
    seen = set()
    for i in range(3):
        seen |= set(np.unique(dataset[i]["gt_seg_map"]).tolist())
    assert seen == set(range(5)) | {IGNORE_INDEX}
