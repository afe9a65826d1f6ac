# mmseg's ISPRS Potsdam base (PotsdamDataset, data/potsdam, 6 classes, 512x512 crops, label 0
# ignored) at 2 images per card: 8 cards x 2 = 16 images a step, mmseg's total batch (4x4).
#
# Dataset: request it at https://www.isprs.org/education/benchmarks/UrbanSemLab/2d-sem-label-potsdam.aspx,
# put 2_Ortho_RGB.zip and 5_Labels_all_noBoundary.zip in one folder, then clip the tiles
# with mmseg's script (it writes data/potsdam/{img_dir,ann_dir}/{train,val}):
#   python $(python -c "import mmseg,os;print(os.path.dirname(mmseg.__file__))")/.mim/tools/dataset_converters/potsdam.py /path/to/zips -o data/potsdam
_base_ = ["mmseg::_base_/datasets/potsdam.py"]

train_dataloader = dict(batch_size=2)
