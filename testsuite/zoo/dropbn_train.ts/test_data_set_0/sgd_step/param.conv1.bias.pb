B
conv1.biasJ Ì\¾µüH>`'–½ïv0>tŸò¼ŒÑ/>Äý½MBE=