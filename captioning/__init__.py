"""Image captioning: Att2in on COCO bottom-up features with Bayesian attention (in progress)."""
