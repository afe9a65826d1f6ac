"""The synthetic set is read by the config's own dataset class, labels as it expects, and
its validation images have the shapes of the dataset's."""

import numpy as np
import pytest

from mmgcu.rehearsal.data import ASPECTS, IGNORE_INDEX, val_sizes, write_dataset


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
    facts = write_dataset(str(tmp_path), cfg, "train", [(32, 32)] * 3, model)
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


def test_each_image_has_its_size_and_an_ignored_border_of_its_own(tmp_path):
    import cv2

    sizes = [(32, 48), (40, 24), (32, 32), (64, 40)]
    cfg = dict(type="CityscapesDataset", data_root=str(tmp_path))
    write_dataset(str(tmp_path), cfg, "val", sizes, dict(decode_head=dict(num_classes=4)))
    names = open(tmp_path / "val.txt").read().split()
    depths = set()
    for name, size in zip(names, sizes):
        image = cv2.imread(str(tmp_path / "img_dir" / "val" / f"{name}_leftImg8bit.png"))
        mask = cv2.imread(str(tmp_path / "ann_dir" / "val" / f"{name}_gtFine_labelTrainIds.png"), 0)
        assert image.shape[:2] == size and mask.shape == size
        depths.add(int((mask == IGNORE_INDEX).all(axis=1).sum()))
    assert len(depths) > 1  # the count of ignored pixels changes from image to image


def test_a_dataset_of_one_size_gives_that_size_scaled():
    sizes, where = val_sizes(dict(type="CityscapesDataset"), 4, 128, 0.125)
    assert sizes == [(128, 256)] * 4 and "1024 x 2048" in where


def test_a_photo_dataset_gives_varied_aspect_ratios():
    sizes, where = val_sizes(dict(type="ADE20KDataset"), 12, 128, 0.25)
    assert len(set(sizes)) == len(ASPECTS) == 12
    assert all(min(s) == 128 for s in sizes)
    assert "ADE20KDataset photos of 12 aspect ratios" in where


def test_an_unknown_dataset_is_taken_as_varied():
    sizes, where = val_sizes(dict(type="MyDataset"), 3, 64, 1.0)
    assert len(set(sizes)) == 3 and "not known" in where


def test_the_users_own_images_give_their_sizes(tmp_path):
    """Read from the headers of the images in the config's folder, scaled."""
    from PIL import Image

    folder = tmp_path / "images" / "val"
    folder.mkdir(parents=True)
    for i, (w, h) in enumerate([(400, 300), (300, 400), (500, 500)]):
        Image.new("RGB", (w, h)).save(folder / f"{i}.jpg")
    (folder / "notes.txt").write_text("not an image")
    cfg = dict(
        type="ADE20KDataset", data_root=str(tmp_path), data_prefix=dict(img_path="images/val")
    )
    sizes, where = val_sizes(cfg, 6, 128, 0.5)
    assert sizes == [(150, 200), (150, 200), (200, 150), (200, 150), (250, 250), (250, 250)]
    assert where == "the sizes of 3 of your images"
