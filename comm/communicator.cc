// Placeholder until this folder's first component lands.
