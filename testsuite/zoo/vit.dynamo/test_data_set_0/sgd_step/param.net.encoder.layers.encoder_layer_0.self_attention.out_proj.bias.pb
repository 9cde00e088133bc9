 B?net.encoder.layers.encoder_layer_0.self_attention.out_proj.biasJ€ÑĞ¼ô»Y£±»t¢ÖºùÙ;¢ë=½Ğ¤=d^¼%d¼9‡½M=E›<–±=§ö»é¸¼Ò•½$¤I< B=Ü#;lœ<¢üı¼ë/¼‰-<
ë:g’<ü+Œº‰sp<šÏ;›Ä<‡<Öe½ß}m¼