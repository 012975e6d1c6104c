"""The target model as the pipeline sees it: its tokenizer, chat template and token roles,
the model loaded for inference, hidden-state capture, and single tensors of its checkpoint."""
