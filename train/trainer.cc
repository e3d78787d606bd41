// Placeholder until the training loop lands.
