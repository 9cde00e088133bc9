Bnet.features.7.block.3.1.weightJ@¦õÃµû‰µ]Ÿ16vå¢4T
7'-FµhSÖµ¤Nd¶şï·ca:µÛx²3T*óµ{V´»f6CÌ·ö³