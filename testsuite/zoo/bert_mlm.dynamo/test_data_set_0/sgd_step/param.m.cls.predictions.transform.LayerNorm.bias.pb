 B*m.cls.predictions.transform.LayerNorm.biasJ€ØÖ<²š:¼n.
<H×<îO±¼ßŠˆ:˜Şk¼$£-½–¼€´½…VZ;Ó±=Xì]¼)¥6<ó	<;º<£¼›1Q½
 »J±=Ã(=NE<`û|¼;¦Ñ¼­à½Z¸<ÃŞ¼šÊ~<HW;z×º;F=ñÊŸ¼