 B*encoder.layers.1.self_attn_layer_norm.biasJ€ÚV´:/O•¸ÛÅMºžZ9…Â:‡U:V:‰‚º¦FÖ9>Xb9Š:nc[9#Exºæ‰uºö1É¹áŒ:RXƒ¹ Òçºæ3´¹z¸½:ÇnªºNÊ:Ñ ~:4NX·ýÖµº“bcºá€¹…&»§js:à>7+o):Ø
«9