Bnet.features.1.block.0.1.biasJ æİ´à“®1¥J
4Ş¿3 ’³%FŞ4ü*´×µ7´