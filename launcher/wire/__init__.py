"""What client and container agree on: the /opt/ml tree, hyperparameter encoding, metric and
progress lines, checkpoint layout, channel files, secret masking. Imports nothing else of smlaunch."""
