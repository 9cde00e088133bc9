
Bnet.heads.head.biasJ(ûBâ=¡Â=M`à=@Î=W¬Ì¾C¾=h¯¸=u¯=R/È¾e0Ú=