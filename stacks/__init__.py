"""CDK stacks for Ebb: one construct per concern, composed by stacks that hold no logic."""
