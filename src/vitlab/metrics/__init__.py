"""Scores of predictions and the k-NN vote over frozen features: segmentation (mIoU from a confusion matrix), depth
(RMSE, AbsRel, delta < 1.25 ...) and nearest neighbours. They know no model, data set or command, so evaluation,
the dense probes and the training objectives all measure with them."""
