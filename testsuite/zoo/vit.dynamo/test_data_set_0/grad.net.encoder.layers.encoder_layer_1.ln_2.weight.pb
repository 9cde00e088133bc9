 B.net.encoder.layers.encoder_layer_1.ln_2.weightJ€Á5¼î¹¤»q²4¼0;óöÆ:(õ'¼>ˆºÓfZºKè¼¦ð•<}Tn¼”Pr9ôÄ<º7ºVúÉ:òG®º«Á<FJv:2–ò;øž.<dOo»Þ¨À8[]²:îóü¼{ü$;@sÔº
á;‰'»»$½»\ë¶»§½O;ôÕÃ;