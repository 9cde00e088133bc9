 B&encoder.layers.0.self_attn.v_proj.biasJ€:¢S<¹Oq<à¨¼ÒË,¼fEì;I›»æ&©»(–»"Øo»ù¼X”‚»ª$;9÷E¼æc‹<$†4<Ë…â¹b}è¹ˆÖL¼e’•<Vs4<ÅtÈ»l
„;½Ø¤;Üb+<õÆ©¼‡[¸;Î‚[;Ý7€¼Dûø<­¾¼—b»­ë;