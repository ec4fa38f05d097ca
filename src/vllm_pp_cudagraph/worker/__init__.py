"""What each worker runs: the plugin's model runner."""
