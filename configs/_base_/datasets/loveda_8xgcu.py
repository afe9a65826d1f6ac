# mmseg's LoveDA base (LoveDADataset, data/loveDA, 7 classes, 512x512 crops, label 0 ignored)
# at 2 images per card: 8 cards x 2 = 16 images a step, mmseg's total batch for LoveDA (4x4).
#
# Dataset: Train.zip, Val.zip and Test.zip from https://zenodo.org/records/5706578 (or the
# Google Drive of https://github.com/Junjue-Wang/LoveDA) in one folder, then convert with
# mmseg's script (it writes data/loveDA/{img_dir,ann_dir}/{train,val}):
#   python $(python -c "import mmseg,os;print(os.path.dirname(mmseg.__file__))")/.mim/tools/dataset_converters/loveda.py /path/to/zips -o data/loveDA
_base_ = ["mmseg::_base_/datasets/loveda.py"]

train_dataloader = dict(batch_size=2)
