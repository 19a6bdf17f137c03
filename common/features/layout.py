"""The on-disk layout of a region-feature file (HDF5), shared by the writer and the store.

One file holds every image, ragged: the regions of all images are concatenated along
dim 0 and an index says where each image's rows start and how many there are::

    /features     [R, D]  float16 (or float32), chunked by rows, Fletcher-32 checksummed
    /boxes        [R, 4]  float32, (x1, y1, x2, y2) in pixels
    /image_ids    [M]     int64
    /first_region [M]     int64   row of the image's first region in /features
    /num_regions  [M]     int32
    /image_size   [M, 2]  int32   (height, width)
    attrs: format, version, feature_dim

``R`` may exceed ``first_region[-1] + num_regions[-1]`` after an interrupted write: rows
past the last indexed image are not part of the file's content (the writer overwrites
them when it resumes).
"""
FORMAT = "attention-suite/region-features"
VERSION = 1
FEATURES = "features"
BOXES = "boxes"
IMAGE_IDS = "image_ids"
FIRST_REGION = "first_region"
NUM_REGIONS = "num_regions"
IMAGE_SIZE = "image_size"
INDEX = (IMAGE_IDS, FIRST_REGION, NUM_REGIONS, IMAGE_SIZE)
