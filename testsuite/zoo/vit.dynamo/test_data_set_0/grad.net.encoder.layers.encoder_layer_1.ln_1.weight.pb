 B.net.encoder.layers.encoder_layer_1.ln_1.weightJ€¤:ª;Ğ@t;€);Ê†»‹»Š±¯ºôÿ;ÖÈ¼fKûº…t™»˜Öš;j[<ì#»İ-<)ÌÌ»ÍÑ²»Sˆ‘»™U@<8÷s»|ti:ªC´¹wW<3óñ:C	…<Ø‘;,;™¦c»ÕwÙ:H€<ÕÁ:o
‡<Ÿbö¹