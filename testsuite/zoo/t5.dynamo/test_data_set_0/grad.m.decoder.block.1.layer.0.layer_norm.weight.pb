 B+m.decoder.block.1.layer.0.layer_norm.weightJ€°®½S—D½;œg¾óaš½
xB¾'»=>Ñ<½}—ƒ¾Åy’¾t½¸½ÝÎE¿©m>›|-¾Ø7A¾«S¾u>X´=¼æM½½'’=.À¸½Í¾½Â+’»Ò=(Ðö¼1Ü^¼WÊ=A“½Ûx¼½8fç=¥€¾Æ†¾