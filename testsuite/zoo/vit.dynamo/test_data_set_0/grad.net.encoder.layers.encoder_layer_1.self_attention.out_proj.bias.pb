 B?net.encoder.layers.encoder_layer_1.self_attention.out_proj.biasJ€ÒÃÙ¼À4”9AY<6M¼2I¼î=Ão8»PšŽ¼€«<Xøè;Í½Ú; »Û»íÓ”½Çù
¼ZKí<ˆ}:²Có< <ì:ž=h<óÿ;½Ó“™¼æz‚<Îq<È¯'½p¦r<K!÷<tµY;d§¼ÀÌe:l	ë<¦š…¼>0ñ<