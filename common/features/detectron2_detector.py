"""A detectron2 Faster R-CNN (C4: ResNet + ``Res5ROIHeads``) as an ``extract.Detector``.

Follows the detectron2 port of bottom-up attention (airsplay/py-bottom-up-attention,
``demo/detectron2_mscoco_proposal_maxnms.py``): RPN proposals, the res5 head on each
proposal, its output mean-pooled (2048-d for ResNet-101) as the region feature, class
probabilities from the box predictor. detectron2 is imported only when a detector is
built; it is not on PyPI and cannot run in this project's CPU-only test environment.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .extract import Proposals

INSTALL = ("detectron2 is not installed. It is not on PyPI: install a build matching your torch and CUDA "
           "(https://detectron2.readthedocs.io/en/latest/tutorials/install.html, e.g. "
           "pip install --no-build-isolation 'git+https://github.com/facebookresearch/detectron2.git'). "
           "Anderson et al.'s Visual Genome ResNet-101 weights for detectron2 come with "
           "airsplay/py-bottom-up-attention (faster_rcnn_R_101_C4_attr_caffemaxpool.yaml + its .pkl).")


class Detectron2Detector:
    """``Detectron2Detector(config_file, weights, device="cuda", opts=("MODEL.ROI_HEADS.NUM_CLASSES", "1600"))``."""

    def __init__(self, config_file: str, weights: str, device: str = "cuda", opts: Sequence[str] = ()):
        try:
            from detectron2.config import get_cfg
            from detectron2.engine import DefaultPredictor
            from detectron2.modeling.roi_heads import Res5ROIHeads
        except ImportError as err:
            raise ImportError(INSTALL) from err
        cfg = get_cfg()
        cfg.merge_from_file(config_file)
        cfg.merge_from_list(list(opts))
        cfg.MODEL.WEIGHTS, cfg.MODEL.DEVICE = weights, device
        self.predictor = DefaultPredictor(cfg)
        self.input_format = cfg.INPUT.FORMAT
        if not isinstance(self.predictor.model.roi_heads, Res5ROIHeads):
            raise ValueError(f"{config_file}: region features need a C4 model (ROI_HEADS.NAME: Res5ROIHeads), whose "
                             f"pooled res5 output is the 2048-d bottom-up feature; got "
                             f"{type(self.predictor.model.roi_heads).__name__}")

    def detect(self, image: np.ndarray) -> Proposals:
        model, heads = self.predictor.model, self.predictor.model.roi_heads
        height, width = image.shape[:2]
        if self.input_format == "BGR":
            image = image[:, :, ::-1]
        resized = self.predictor.aug.get_transform(image).apply_image(image)
        tensor = torch.as_tensor(np.ascontiguousarray(resized, dtype=np.float32).transpose(2, 0, 1))
        images = model.preprocess_image([{"image": tensor, "height": height, "width": width}])
        maps = model.backbone(images.tensor)
        proposals, _ = model.proposal_generator(images, maps, None)
        boxes = proposals[0].proposal_boxes
        pooled = heads._shared_roi_transform([maps[name] for name in heads.in_features], [boxes]).mean(dim=(2, 3))
        logits = heads.box_predictor(pooled)[0]
        probs = torch.softmax(logits.float(), dim=-1)
        scale = boxes.tensor.new_tensor([width / resized.shape[1], height / resized.shape[0]] * 2)
        return Proposals(boxes=boxes.tensor * scale,
                         class_scores=torch.cat([probs[:, -1:], probs[:, :-1]], dim=1),  # background last -> first
                         features=pooled)
